"""The build's one exception family: every message names the model and the problem."""


class BuildError(Exception):
    """Base of every error the build raises on purpose."""


class CatalogueError(BuildError):
    """The catalogue (or one entry of it) is wrong."""


class ExportError(BuildError):
    """Weights could not be loaded into the architecture, or the export failed."""
