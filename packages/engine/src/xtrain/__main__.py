"""``python -m xtrain``: the xtrain command line (how torchrun starts each rank: ``torchrun ... -m xtrain train``)."""

from xtrain.cli import main

main()
