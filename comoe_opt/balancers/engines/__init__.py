"""The balancers serving engines ship today, ported from their published sources."""
