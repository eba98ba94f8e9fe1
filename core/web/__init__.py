"""The web: safe page fetches (fetch.py, safety.py) and search (search.py), for the tools that read the web."""
