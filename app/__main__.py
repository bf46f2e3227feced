"""`python -m app`: the specchat command."""
import sys

from .cli import main

sys.exit(main())
