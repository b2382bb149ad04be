/* attn_simt_kernel instantiations with 4 rows per warp (attn_simt.cuh). */
#include "attn_simt.cuh"

void mlk_attn_simt_launch_r4(mlk_backend *b, const mlk_attn_args *a, dim3 grid)
{
    simt_launch<4>(b, a, grid);
}

void mlk_attn_simt_init_r4(void)
{
    simt_allow_smem<4>();
}
