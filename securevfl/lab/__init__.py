"""The lab: composition of methods with defenses and attacks, sweeps, store and reports.

This is the only part of ``securevfl`` allowed to import the top-level ``attacks`` and
``defenses`` packages (a test enforces it)."""
