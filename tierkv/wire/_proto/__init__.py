"""Code generated from proto/ by scripts/gen-proto.sh; do not edit."""
