"""The GPU check for a lent device (gpu_check.sh, gpu_check.py; its training runs gpu_runs.py, its patent-length
stages gpu_patent.py), its wheels and data (gpu_wheels.sh), the rehearsal in a copy of the device's Python
(gpu_rehearsal.sh, gpu_rehearsal.py, the image's packages gpu_image.txt), the device profile (gpu_profile.py)."""
