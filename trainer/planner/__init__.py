"""The planner: predicts the step time of a parallel layout by simulating its schedule with the costs
of a device profile, and ranks the layouts for a number of devices (launch/plan.py).

    shapes.py     what each instruction of a layout works on, cut from real batches as the interpreter cuts them
    profile.py    device profiles (files): a calibrated table of this machine's layers or a GPU's rates
    costs.py      an instruction's seconds from its shapes and a profile; transfers and collectives
    candidates.py the layouts worth trying for N devices
    plan.py       simulate each candidate over real batches, rank them, write the winner's DeepSpeed JSON
    calibrate.py  measure this machine's profile (the real layers, gloo transfers, two ranks at once)
"""
