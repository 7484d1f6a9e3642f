"""The planner: predicts the step time of a parallel layout by simulating its schedule with the costs
of a device profile, and ranks the layouts for a number of devices (launch/plan.py).

    shapes.py          what each instruction of a layout works on, cut from real batches as the interpreter cuts them
    profile.py         device profiles (files); a calibrated machine's layer tables (MeasuredDevice)
    roofline.py        a GPU priced from its rates (RooflineDevice)
    fit.py             non-negative least squares and interpolation for the tables
    costs.py           an instruction's seconds from its shapes and a device; transfers and collectives
    candidates.py      the layouts worth trying for N devices
    plan.py            simulate each candidate over real batches, rank them, write the winner's DeepSpeed JSON
    cli.py             launch/plan.py's arguments and report
    calibrate.py       measure this machine's profile (the real layers); calibrate_ranks.py the parts that need
                       DeepSpeed, a second process, or two ranks (optimizer step, contention, gloo, the interpreter),
                       their engines, runners and runtimes built by trainer.training.build.Build
"""
