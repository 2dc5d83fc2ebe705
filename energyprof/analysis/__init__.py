"""Pure analysis: Profile (facts) + render options -> what the renderers show. No I/O."""
