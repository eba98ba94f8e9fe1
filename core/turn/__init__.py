"""One turn of the assistant: its chat's slot (one turn at a time per chat), its journal (every write), the runner (the
access check, the files taken in, the agent) and the reply port its answer goes out through."""
