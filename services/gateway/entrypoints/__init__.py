"""How the gateway is driven: bus subscribers (``bus``), the HTTP app (``http``) and periodic work (``loops``)."""
