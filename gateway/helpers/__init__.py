"""The gateway's helper processes: framing, budgets and workers shared by the intake and the rules."""
