"""The web: search providers and safe page fetches."""
