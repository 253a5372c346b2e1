"""Ray Serve as a second engine for the same archives: a cluster launcher (launcher.py, nodes.py),
the Serve config it deploys (serve_config.py) and the app that runs an archive's handler (app.py,
context.py)."""
