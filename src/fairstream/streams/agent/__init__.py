"""The pipeline's monitoring agent: it gathers the shadow evidence and applies the promotion rule."""
