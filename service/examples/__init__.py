"""Example transforms shipped with txstage (``TXSTAGE_TRANSFORM=service.examples.<m>:<fn>``)."""
