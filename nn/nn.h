// Umbrella header of the nn module.
#pragma once

#include "nn/attention_layer.h"
#include "nn/functional.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/layers_general.h"
#include "nn/models/mnist_net.h"
#include "nn/module.h"
