// tandem-test CONFIG CHECKPOINT [tandem-train's flags]: MMEngine's tools/test.py; evaluates the
// checkpoint's weights on the config's val dataset with its val_evaluator and prints the metrics.
#include "tandem-mnist/trainer.h"

int main(int argc, char** argv) { return tandem::app::test_main("tandem-test", argc, argv); }
