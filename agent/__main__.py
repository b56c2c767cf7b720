"""`python -m agent`: the same command line as the `ipvs-leftovers` console script."""

from agent.cli import main

main()
