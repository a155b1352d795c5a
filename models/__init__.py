"""fairstream.models: learned fairness modules in torch (flow preprocessor, fair scorers, embedding module)."""
