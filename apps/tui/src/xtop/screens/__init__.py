"""The dashboard's screens: jobs, run, devices, trace (switched by 1-4), and the log, confirmation and help
screens pushed over them."""
