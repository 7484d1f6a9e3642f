"""The GPU check for a lent device (gpu_check.sh, gpu_check.py), its wheels and data (gpu_wheels.sh), the device profile (gpu_profile.py)."""
