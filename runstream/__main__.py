"""`python -m runstream ...`: the command line, as the `runstream` script."""

from runstream.engine.cli import main

main()
