// tandem-train CONFIG [--work-dir DIR] [--resume [CKPT]] [--amp] [--cfg-options KEY=VALUE ...]
// [--launcher none|pytorch|slurm|mpi]: MMEngine's tools/train.py; any registered model and dataset
// (train/models/zoo.h) from the config, as tandem-mnist trains the MNIST net.
#include "tandem-mnist/trainer.h"

int main(int argc, char** argv) { return tandem::app::train_main("tandem-train", argc, argv); }
