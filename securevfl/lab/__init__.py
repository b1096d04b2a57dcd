"""The lab: composition of methods with defenses and attacks, sweeps, store and reports.

The top layer (docs/architecture.md): the only part of ``securevfl`` that imports the ``attacks``
package; nothing below it (the run pipeline, a party's process, the defenses) imports the lab
(tests/test_layering.py enforces both)."""
