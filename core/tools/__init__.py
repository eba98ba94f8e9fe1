"""Tools the model can call: the framework (schemas, envelopes, the registry) and the built-in tools."""
