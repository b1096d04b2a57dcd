"""The settings layer below the public :mod:`securevfl.config`: the settings sections and their
fields, the one validator, the spec parser, input limits, the catalog of names and the generated
settings reference."""
