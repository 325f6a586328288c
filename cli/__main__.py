"""`python -m cli` runs the `tessera` command."""
from cli.app import main

if __name__ == "__main__":
    main()
