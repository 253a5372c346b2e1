"""Drive one TorchServe: `launcher.TorchServe` starts it (temp dir, free loopback ports, token
auth, always stopped); the rest reads its config, talks to its APIs and reads its logs and metrics."""
