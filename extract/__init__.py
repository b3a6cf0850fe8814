"""Cost models and extractors (shipped as optimus_eqsat.extract)."""
