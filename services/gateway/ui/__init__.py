"""The web dashboard served at /ui/: server-rendered pages over the gateway's own read models."""
