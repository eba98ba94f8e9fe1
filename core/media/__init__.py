"""Media people send: documents (text extracted), images (resized for the model), audio (transcribed, spoken)."""
