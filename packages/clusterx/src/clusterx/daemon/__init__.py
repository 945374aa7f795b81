"""The local scheduler daemon: runs queued jobs of the local backend on this machine."""
