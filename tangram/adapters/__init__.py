"""Adapters that plug Tangram into RL frameworks (verl: `tangram.adapters.verl`)."""
