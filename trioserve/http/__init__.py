"""The HTTP side: Quart-trio apps served by hypercorn's trio worker."""
