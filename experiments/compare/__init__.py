"""The policy comparison behind experiments/compare_policies.py (its docstring says
what the experiment is and how to run it), one module per concern:

    options  the command line, its defaults and checks, the config dict
    matrix   the rows, the order of the runs, each run's launcher command,
             the time estimate
    runner   one run: the launcher as a child process, its figures and its
             failure reason; the machine's description
    stats    means and ranges over seeds, "beyond the noise" calls
    report   the markdown report and results.json (the main matrix and the
             one-axis matrices' entries in one document)
    axes     the one-axis matrices' sections and plots (staleness, groups)
    plots    the PNGs (matplotlib, or /usr/bin/python3 when only it has it)
    main     the command itself: run the matrix, --report_only, --plots_only

Standard library only, except plots (matplotlib). The modules import each
other relatively, so the package works as `compare` (the entry script puts
experiments/ on sys.path) and as `experiments.compare`.
"""
