"""Rule sets, one per family (shipped as optimus_eqsat.rewrites)."""
