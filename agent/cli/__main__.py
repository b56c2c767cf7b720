"""`python -m agent.cli`: the same command line as the `ipvs-leftovers` console script."""

from agent.cli import main

main()
