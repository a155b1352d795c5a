"""fairstream.repair: the math of distributional optimal-transport repair, metrics and artifacts (numpy, scipy, POT only)."""
