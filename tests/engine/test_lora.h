/* Shared by the two files of the test_lora executable: test_lora.c (the op,
 * loading, goldens, main) and test_lora_config.c (adapter_config.json). */
#ifndef ML_TEST_LORA_H
#define ML_TEST_LORA_H

/* adapter_config.json parsing and target matching (test_lora_config.c). */
void test_config(void);

#endif
