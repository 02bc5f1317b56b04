"""`python -m hf_dspark.training --data ... --output_dir ...`, also `accelerate launch -m hf_dspark.training ...`."""

from .train import main

if __name__ == "__main__":
    main()
