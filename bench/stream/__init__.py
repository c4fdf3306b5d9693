"""python -m bench stream's pieces: the streaming client, the bare floors, the platform, the report."""
