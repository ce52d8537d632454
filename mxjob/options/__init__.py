"""Every setting declared once, the option types, and the run's settings resolved at the command line's edge."""
