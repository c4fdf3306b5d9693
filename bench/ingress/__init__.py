"""python -m bench ingress's pieces: the open-loop and burst loads of short streamed requests."""
