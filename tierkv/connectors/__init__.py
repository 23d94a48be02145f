"""Engine hooks: they decide what to store and restore, and never speak gRPC themselves."""
