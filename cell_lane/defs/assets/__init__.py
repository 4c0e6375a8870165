"""Cell lane assets, grouped by the stage of the loop they belong to."""
