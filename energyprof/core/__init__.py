"""The pure core: ledger (the online fold), timeline and tree. No I/O, no clock, no hardware."""
