"""Ansible, the one place gpuops imports it: the hosts of an inventory (``inventory``) and a
playbook run limited to some hosts through ansible-runner (``runner``: its events, status and
artifacts, cancellation).
"""
