"""Example capabilities: each file is the exact code an admin's model would pass to write_capability."""
