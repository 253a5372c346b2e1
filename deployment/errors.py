"""The one exception family of deployment/: each message names what is wrong and the fix."""


class DeployError(Exception):
    """Bad input (config, mix record, plan options) or a generated file that fails validation."""


class ValidationFailed(DeployError):
    """A generated manifest does not match its schema."""
