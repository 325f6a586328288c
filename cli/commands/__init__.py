"""One module per group of nouns; each exposes Typer sub-apps that cli.app mounts."""
