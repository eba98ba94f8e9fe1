"""The adapter conformance kit: one set of behaviour tests every platform adapter passes against its own fake."""
