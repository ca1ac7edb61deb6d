"""Plaza's command line: ``plaza up``, ``plaza gateway``, ``plaza worker``, ``plaza services``."""
