// tandem-mnist: the bundled MNIST trainer, tandem-train under the name its configs and scripts
// know (the MNIST net is the default model).
#include "trainer.h"

int main(int argc, char** argv) { return tandem::app::train_main("tandem-mnist", argc, argv); }
