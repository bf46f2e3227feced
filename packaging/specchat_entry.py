"""Entry point of the bundle: the same `specchat` command line, frozen."""
import sys

from app.cli import main

if __name__ == "__main__":
    sys.exit(main())
