"""The HTTP API's room in the core: service.py (`Api`, what the HTTP front end calls), sessions.py (its sessions in
SQL, and a token's caller with the session it names in one round trip), feed.py (live answers to read on from any
event) and parts.py (sessions, messages and parts as the API tells them)."""
