"""Scripts another interpreter runs by path. Python puts a script's own folder first on ``sys.path``;
this folder holds nothing else, so no anyspec module can shadow what those scripts import."""
