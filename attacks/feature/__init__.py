"""Feature-inference attacks by the active party against a passive party's features."""
